"""The ledger's database: models, engine setup and schema version checks."""
