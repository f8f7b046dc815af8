"""What a topic costs: counters scraped from brokers (`counters`) priced by a model (`model`).

`memq cost` (memq/cli/cost.py) does the scraping; everything here is pure and unit-tested.
"""

from memq.cost.counters import Compacted, Snapshot, TopicCounters, Usage, parse_metrics, request_class, usage
from memq.cost.model import (Compaction, Estimate, KafkaBill, Line, MemqBill, as_dict, estimate, kafka_lines,
                             price_source, report)

__all__ = ["Compacted", "Compaction", "Estimate", "KafkaBill", "Line", "MemqBill", "Snapshot", "TopicCounters",
           "Usage", "as_dict", "estimate", "kafka_lines", "parse_metrics", "price_source", "report", "request_class",
           "usage"]
