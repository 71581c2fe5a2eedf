"""The inputs gplan plans from and the rules a configuration keeps: spec.model (ModelSpec), spec.training
(TrainingSpec), spec.parallel (ParallelConfig and its RULES), spec.targets (what each engine runs), spec.names
(the names they are written in), spec.loaders (model files and Hugging Face configs)."""
