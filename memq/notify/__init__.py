"""memq.notify: notification topics on Kafka (confluent-kafka): admin, publisher, consumer."""

from memq.notify.admin import KafkaTopic, TopicAdmin, TopicCreator
from memq.notify.consumer import NotificationConsumer, NotificationRecord
from memq.notify.publisher import NotificationPublisher

__all__ = ["KafkaTopic", "NotificationConsumer", "NotificationPublisher", "NotificationRecord", "TopicAdmin", "TopicCreator"]
