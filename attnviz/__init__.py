"""attnviz: see and check what multi-head attention does.

The package is split by stage (see DESIGN.md): loading and tokenizing, the attention layer,
the pipeline that runs it, analysis, and renderers. Nothing here imports the command line.
"""

__version__ = "0.1.0"
