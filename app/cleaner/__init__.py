"""The log cleaner: retention (cleanup.policy=delete) and transaction-aware compaction."""
