"""The trace store: schema, records, the crash-safe writer and the reader. Imports nothing above it."""
