"""Apache Iceberg tables: metadata and manifests through pyiceberg, rows through deltatail's storage, the feed."""
