"""``python -m bench.kafka``: fill Kafka's cache (scripts/setup runs it); prints its libs."""

from bench.kafka.fetch import fetch

print(fetch())
