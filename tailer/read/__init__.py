"""Reading rows: data, cdc and deletion-vector files into change batches, with reader processes and read-ahead."""
