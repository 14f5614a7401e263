"""The background coordinator: negotiation in rounds, fusion, execution lanes (docs/coordinator.md)."""
