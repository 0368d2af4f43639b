"""Platform and format constants every layer shares: a leaf module that imports nothing of
StrataMQ, so the store's file modules and the settings can both use them without a cycle."""

OS_PAGE_SIZE = 4096  # bytes; flush thresholds count dirty pages of this size
CQ_UNIT_SIZE = 20  # bytes of one ConsumeQueue unit (docs/formats/consumequeue-unit.md)
# RocketMQ reads sizes into Java ints and maps each file with one int-sized buffer, so a larger
# value is neither a RocketMQ setting nor a file RocketMQ could open.
INT_MAX = 2**31 - 1

__all__ = ["CQ_UNIT_SIZE", "INT_MAX", "OS_PAGE_SIZE"]
