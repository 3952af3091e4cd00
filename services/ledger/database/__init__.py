"""The ledger's database: the connection pool, the tables, the migrations and every SQL statement
(docs/ledger.md, "Layout")."""
