#!/usr/bin/env bash
# Retrain the shipped tiny agent model from scratch and rewrite boxmaker/model/tiny-agent.gguf.
#
# Four phases, each seeded, on one CPU thread (needs `pip install -e '.[train]'`). The
# shipped file was made by exactly this chain: the first two phases were stopped by hand at
# the step given by --stop-at (a later phase changed the data mix), and --stop-at replays that.
#   1. default mix (boxmaker.model.data.FAMILIES), lr 3e-3 cosine over 6203 steps, stopped at
#      2415: learns the format, the tool choice and copying names from the question;
#   2. a tool-heavy mix, lr 2e-3 cosine over 1812 steps, stopped at 445;
#   3. adds the short "lookup" family (a result in the user message answered in the tool
#      answer's words) so the model learns to quote result values; lr 2e-3 -> 3e-5 over 2316;
#   4. more two-city dialogues and the think_cut family (a reasoning ended by reasoning_end);
#      lr 1e-3 -> 3e-5 over 1101 steps;
#   5. a fine-tune for the cache, loops and server issues: think_budget (the per-request
#      thinking budget forces "</think>" alone, "<think></think>" at 0), cut_answer (the
#      answer's reasoning cut), cycle (two tools alternated), after_limit (an answer after a
#      limit's "not run" result) and kept (history rendered with preserve_thinking);
#      lr 1e-3 -> 3e-5 over 1400 steps;
#   6. more after_limit and two_city (phase 5 left after_limit at 2/10 and two_city values one
#      below phase 4), lr 5e-4 -> 2e-5 over 600 steps;
#   7. after_nudge, the turn as the loop leaves it with on_limit = "answer" (the guard's
#      nudge, "not run: the turn ended (...); answer the user now ..."), on which phase 6
#      still wrote a tool call as text; lr 1.5e-4 -> 1e-5 over 400 steps;
#   8. the same mix with fewer after_nudge, lr 6e-5 -> 1e-5 over 250 steps.
#   9. the multi-format files (boxmaker/model/tiny-agent-qwen3.gguf, tiny-agent-llama3.gguf):
#      a fine-tune of the shipped file (the phase-8 output) in the extended vocab (Llama 3's
#      special tokens and accented letters appended, existing ids unchanged), each sample
#      rendered in one chat format: boxmaker's own template 20%, Qwen3's real template 35%,
#      Llama 3.1's 45% (reasoning families only where the template renders reasoning), 15% of
#      the random names with diacritics; lr 1e-3 -> 3e-5 over 1300 steps. One run, one GGUF
#      per format (the same weights, each with its template and special tokens). It does not
#      touch tiny-agent.gguf; run it alone with `scripts/train_model.sh --phase9`.
# 8,927 steps: about 138 minutes on one free core. Phases 5 to 8 alone (from the phase-4
# file: train --init accepts a .gguf) take about 38; phase 9 about 30 (longer on a busy one).
set -euo pipefail
WORK="${TMPDIR:-/tmp}/boxmaker-train"
mkdir -p "$WORK"
phase9() {
    python -m boxmaker.model.train --seed 9 --steps 1300 --threads 1 \
        --init "$1" --lr 1e-3 --lr-floor 3e-5 --warmup 30 \
        --formats tiny=20,qwen3=35,llama3=45 \
        --mix weather=12,time=10,two_city=18,lookup=10,think_cut=3,think_budget=5,cut_answer=5,think_long=2,repeat=4,cycle=8,after_limit=5,after_nudge=6,kept=5,small_talk=4,copy=6 \
        --snapshot-every 8 --out "$WORK/phase9-{format}.gguf" --checkpoint "$WORK/phase9.pt"
    cp "$WORK/phase9-qwen3.gguf" boxmaker/model/tiny-agent-qwen3.gguf
    cp "$WORK/phase9-llama3.gguf" boxmaker/model/tiny-agent-llama3.gguf
}
if [ "${1:-}" = "--phase9" ]; then
    phase9 boxmaker/model/tiny-agent.gguf
    exit 0
fi
OUT="${1:-boxmaker/model/tiny-agent.gguf}"
python -m boxmaker.model.train --seed 0 --steps 6203 --stop-at 2415 --threads 1 \
    --out "$WORK/phase1.gguf" --checkpoint "$WORK/phase1.pt"
python -m boxmaker.model.train --seed 1 --steps 1812 --stop-at 445 --threads 1 \
    --init "$WORK/phase1.pt" --lr 2e-3 --lr-floor 3e-5 --warmup 30 \
    --mix weather=25,time=22,two_city=18,think_long=5,repeat=8,small_talk=8,copy=14 \
    --out "$WORK/phase2.gguf" --checkpoint "$WORK/phase2.pt"
python -m boxmaker.model.train --seed 2 --steps 2316 --threads 1 \
    --init "$WORK/phase2.pt" --lr 2e-3 --lr-floor 3e-5 --warmup 30 \
    --mix weather=20,time=18,two_city=14,lookup=22,think_long=4,repeat=7,small_talk=7,copy=8 \
    --out "$WORK/phase3.gguf" --checkpoint "$WORK/phase3.pt"
python -m boxmaker.model.train --seed 3 --steps 1101 --threads 1 \
    --init "$WORK/phase3.pt" --lr 1e-3 --lr-floor 3e-5 --warmup 20 \
    --mix weather=14,time=16,two_city=22,lookup=14,think_cut=8,think_long=4,repeat=6,small_talk=6,copy=10 \
    --out "$WORK/phase4.gguf" --checkpoint "$WORK/phase4.pt"
python -m boxmaker.model.train --seed 4 --steps 1400 --threads 1 \
    --init "$WORK/phase4.pt" --lr 1e-3 --lr-floor 3e-5 --warmup 20 \
    --mix weather=10,time=10,two_city=14,lookup=8,think_cut=5,think_budget=8,cut_answer=8,think_long=3,repeat=5,cycle=9,after_limit=8,kept=9,small_talk=5,copy=6 \
    --out "$WORK/phase5.gguf" --checkpoint "$WORK/phase5.pt"
python -m boxmaker.model.train --seed 5 --steps 600 --threads 1 \
    --init "$WORK/phase5.pt" --lr 5e-4 --lr-floor 2e-5 --warmup 10 \
    --mix weather=8,time=8,two_city=20,lookup=10,think_cut=3,think_budget=5,cut_answer=5,think_long=2,repeat=4,cycle=8,after_limit=18,kept=6,small_talk=4,copy=5 \
    --out "$WORK/phase6.gguf" --checkpoint "$WORK/phase6.pt"
python -m boxmaker.model.train --seed 7 --steps 400 --threads 1 \
    --init "$WORK/phase6.pt" --lr 1.5e-4 --lr-floor 1e-5 --warmup 10 \
    --mix weather=10,time=10,two_city=16,lookup=8,think_cut=3,think_budget=5,cut_answer=5,think_long=2,repeat=4,cycle=7,after_limit=5,after_nudge=10,kept=5,small_talk=4,copy=6 \
    --out "$WORK/phase7.gguf" --checkpoint "$WORK/phase7.pt"
python -m boxmaker.model.train --seed 8 --steps 250 --threads 1 \
    --init "$WORK/phase7.pt" --lr 6e-5 --lr-floor 1e-5 --warmup 5 \
    --mix weather=12,time=10,two_city=16,lookup=10,think_cut=3,think_budget=5,cut_answer=5,think_long=2,repeat=4,cycle=8,after_limit=5,after_nudge=6,kept=5,small_talk=4,copy=6 \
    --out "$OUT" --checkpoint "$WORK/phase8.pt"
phase9 "$OUT"
