"""The explorer as a Gradio web app, over the Gradio-free logic of ``coolsd.app`` (``app.py`` starts it).

One room per role, read in this order: ``runtime`` (the running state, made once by ``runtime.start``),
``device`` (where GPU work runs: this process or ZeroGPU), ``inputs`` (control values into a request),
``generation`` (Generate's handlers), ``panels`` (the figure tabs' handlers), ``settings`` (the settings column's
handlers), ``api`` (the public endpoints), ``server`` (the Blocks subclass and the HTTP guard in front of it),
``tools`` (the MCP server over the public endpoints), ``widgets``, ``texts`` and ``layout`` (the page),
``events`` (which handler each control's event runs).
Importing any of them loads no model and starts no thread.
"""
