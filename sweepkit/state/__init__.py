"""What a cell's runs leave on disk: its records (cell.json, state.json) and its metrics."""
