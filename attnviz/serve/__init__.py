"""`attnviz serve`: a local page where a typed text is its heads a moment later, and the HTTP API it uses.

explorer.py: the models loaded once and a request's run through attnviz.heads; http.py: the standard library's
ThreadingHTTPServer with the checks every request passes (docs/architecture.md says why no framework).
"""
