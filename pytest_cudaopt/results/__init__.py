"""What a run says: result records, the ledger of items, the reports, relaxations and blame."""
