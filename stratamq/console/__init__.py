"""The web console (``stratamq console``): server-rendered pages over the broker's admin RPCs.

``broker_api`` calls the broker as the CLI does (``stratamq.client.admin`` / ``messaging``,
signed with the same ACL credentials); ``app`` is the Starlette application; ``server`` runs it
under uvicorn, standalone or inside the broker (``consoleListenPort``).
"""
