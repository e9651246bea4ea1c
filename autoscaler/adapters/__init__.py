"""One adapter per outside system. Only this package imports client libraries."""
