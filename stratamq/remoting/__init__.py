"""RocketMQ 4.x remoting: the frame codec (``codec``), its numbers (``codes``), the asyncio
adapter (``transport``), the NameServer (``namesrv``) and the broker's request handlers.

See docs/formats/remoting-frame.md for the frame.
"""
