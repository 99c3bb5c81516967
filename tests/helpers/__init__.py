"""What tests import: clients and runners (``wire_client``, ``cli_runner``,
``client_helpers``, ``txn_driver``), data builders (``batches``, ``identities``,
``spark_data``), and the faults and nodes of the database (``backends``, ``replication``,
``cluster_nodes``, ``projections``). Modules run as processes of their own are in
``tests/children``."""
