"""boxmaker: a research toolkit for LLM agent turn loops served by llama.cpp's HTTP server."""
