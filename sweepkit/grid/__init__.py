"""Grid files to cells: the declarative API, collection, ids, selection, validation, profiles."""
