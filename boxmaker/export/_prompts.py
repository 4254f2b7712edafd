"""The prompt of each completion of a log in the server's own tokens: the request rebuilt
from the log (:func:`boxmaker.session.messages` of the records before the completion's
``Assistant``, the baseline's tools), rendered by the server's chat template (llama.cpp's
``POST /apply-template``) and tokenized by its tokenizer (``POST /tokenize``), as cache
forensics does (:class:`boxmaker.cache.TemplateServer`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..cache import SentRequest, TemplateServer
from ..errors import BoxmakerError
from ..records import baseline_from_json, records_from_json
from ..session import Reading, messages
from ._errors import ExportError

__all__ = ["PromptTokens"]


class PromptTokens:
    """Token ids of the prompts of a log's completions, asked of a llama-server with the
    session's model (two requests per completion).

    Args:
        server: the server's template and tokenizer endpoints.
        template_kwargs: the ``chat_template_kwargs`` the session ran with
            (:meth:`boxmaker.config.Config.template_kwargs`).
    """

    def __init__(self, server: TemplateServer, template_kwargs: Mapping[str, Any]) -> None:
        self.server = server
        self.template_kwargs = dict(template_kwargs)

    def of(self, reading: Reading) -> dict[int, list[int]]:
        """The prompt's token ids of each completion of ``reading``, by the index of its
        ``Usage`` record.

        Raises:
            ExportError: the server did not answer, or answered in a shape it should not
                (the message names the log and the completion).
        """
        baseline = baseline_from_json(reading.log.head)
        records = records_from_json(reading.records)
        out: dict[int, list[int]] = {}
        for turn in reading.turns:
            for completion in turn.completions:
                upto = (
                    completion.assistant if completion.assistant is not None else completion.usage
                )
                request = SentRequest(
                    messages=tuple(messages(baseline, records[:upto])),
                    tools=baseline.tools,
                    template_kwargs=self.template_kwargs,
                )
                try:
                    text = self.server.render(request)
                    ids = self.server.tokenize(text, add_special=True).ids
                except BoxmakerError as exc:
                    raise ExportError(
                        f"{reading.log.path}: completion {completion.number}: the server at "
                        f"{self.server.url} could not render and tokenize its prompt: {exc}"
                    ) from exc
                out[completion.usage] = list(ids)
        return out
