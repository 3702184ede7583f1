"""Model implementations (plain torch)."""
