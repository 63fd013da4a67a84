"""The built-in pipelines, one package each (``puns/``, ``humor/``, ``curate/``, ``prompts/``), registered through
punchline's own ``punchline.pipelines`` entry points exactly as a plug-in's are: the engine never imports them."""
