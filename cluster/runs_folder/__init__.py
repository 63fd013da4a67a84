"""The runs folder's own services, shared by its drivers: the embedded Redis server, the local Ray head, their keepers
and the folder's locks and private files."""
