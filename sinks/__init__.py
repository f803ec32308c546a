"""Where change rows go: the sink contract and its implementations (embedded, Kafka, Spark)."""
