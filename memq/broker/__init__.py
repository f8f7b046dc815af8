"""memq.broker: the aiohttp broker. Run one with `python -m memq.broker --config FILE`."""

from .metrics import BrokerMetrics
from .processor import TopicProcessor
from .server import Broker

__all__ = ["Broker", "BrokerMetrics", "TopicProcessor"]
