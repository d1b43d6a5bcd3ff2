"""What a run says: result records, the ledger of items, the terminal report and its tables,
the JSON report, the relaxations, and blame."""
