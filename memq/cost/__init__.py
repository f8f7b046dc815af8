"""What a topic costs: counters scraped from brokers (`counters`) priced by a model (`model`).

`memq cost` (memq/cli/cost.py) does the scraping (`scrape`); everything else here is pure and
unit-tested: each topic's break-even rate and what would cut its cost (`breakeven`), the JSON
view of it all (`view`).
"""

from memq.cost.breakeven import Shape, Suggestion, Verdict, break_even, verdict
from memq.cost.counters import Compacted, Seal, Snapshot, TopicCounters, Usage, parse_metrics, request_class, usage
from memq.cost.model import (Compaction, Estimate, KafkaBill, Line, MemqBill, as_dict, estimate, kafka_lines,
                             price_source)
from memq.cost.view import report

__all__ = ["Compacted", "Compaction", "Estimate", "KafkaBill", "Line", "MemqBill", "Seal", "Shape", "Snapshot",
           "Suggestion", "TopicCounters", "Usage", "Verdict", "as_dict", "break_even", "estimate", "kafka_lines",
           "parse_metrics", "price_source", "report", "request_class", "usage", "verdict"]
