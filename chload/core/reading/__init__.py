"""How a file's text is read and what a column can hold: the dialect and header of a
file (dialect, sniff, sample), whether its values fit the table's types (fit), and the
value ranges of a column type (ranges)."""
