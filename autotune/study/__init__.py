"""Where a study lives and how it is read back: the storage (`storage`, `journal`), one trial
as readers see it (`records`), and the read side (`results`, `summary`, `confirmation`) that
`show`, `export` and the report use with nothing but the storage."""
