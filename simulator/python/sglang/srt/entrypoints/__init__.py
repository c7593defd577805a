"""HTTP server and engine of the fake SGLang server."""
