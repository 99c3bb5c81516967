"""The cluster of ``kip98 serve`` nodes sharing one database: their registrations (Kafka's
BrokerRegistration, BrokerHeartbeat, UnregisterBroker) and the live nodes
(DescribeCluster). Where leadership goes is ``app.placement``'s pure rules over them."""
