"""Stream decoding without I/O (h11 style): bytes in, events out; imports neither httpx nor tools.

One layer a module: ``_sse`` (bytes -> SSE events), ``_chunks`` (SSE data -> chunk state and
client events; ``_fast`` reads the usual one-member chunk without a parse, ``_think_tags``
moves ``<think>`` in content to reasoning, ``_shape`` holds what a chunk's fields mean for
both read paths), ``_completion`` (the finished ``Completion``),
``_decoder`` (``StreamDecoder``: the whole stack, shared by the client and the cassette reader).
"""
