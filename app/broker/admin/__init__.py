"""The admin RPCs (the AdminClient's, and Kafka's admin APIs on the wire): topics, configs,
ACLs and the transaction tooling. Each handler runs the library function that does the
work once per item and answers every item with its own error code, so a refused item
leaves the others done, and a refused item has written nothing."""
