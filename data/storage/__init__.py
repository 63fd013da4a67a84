"""What a run keeps in its store and how: the run's layout (the only place a store path is spelled), the response cache
and its spool, JSON and Arrow encoding."""
