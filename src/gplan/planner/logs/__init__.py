"""The engines' own training logs, read as launches are (planner.launch_files): what configuration ran, and
what its steps measured. `gplan calibrate` fits on the steps; `--from LOG` prices the configuration.

One module per engine family, each citing the logging code its formats come from: megatron (Megatron-LM,
NeMo/Megatron-Bridge, Megatron-DeepSpeed's arguments block), deepspeed (the DeepSpeedEngine configuration
and throughput lines), torchtitan, mindformers; whose log a text is: `detect.family`."""
