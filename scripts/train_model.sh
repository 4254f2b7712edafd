#!/usr/bin/env bash
# Retrain the shipped tiny agent model from scratch and rewrite boxmaker/model/tiny-agent.gguf.
#
# Two phases, both seeded and on one CPU thread (needs `pip install -e '.[train]'`):
#   1. the default data mix (boxmaker.model.data.FAMILIES), lr 3e-3 cosine over 6203 steps,
#      stopped at step 2415 (where the shipped run's first phase was stopped);
#   2. from that checkpoint, a tool-heavy mix (more weather/time/two_city, less echo) with
#      lr 2e-3 -> 3e-5 over 1812 steps.
# The shipped file was made by exactly these two commands (see MODEL_CARD.md for the times).
set -euo pipefail
OUT="${1:-boxmaker/model/tiny-agent.gguf}"
WORK="${TMPDIR:-/tmp}/boxmaker-train"
mkdir -p "$WORK"
python -m boxmaker.model.train --seed 0 --steps 6203 --stop-at 2415 --threads 1 \
    --out "$WORK/phase1.gguf" --checkpoint "$WORK/phase1.pt"
python -m boxmaker.model.train --seed 1 --steps 1812 --threads 1 \
    --init "$WORK/phase1.pt" --lr 2e-3 --lr-floor 3e-5 --warmup 30 \
    --mix weather=25,time=22,two_city=18,think_long=5,repeat=8,small_talk=8,copy=14 \
    --out "$OUT"
