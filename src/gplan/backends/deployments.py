"""Export targets that are not engines: gplan's torch worker deployed by a scheduler (`gplan export --to k8s|slurm`),
name -> its module in gplan.backends.exporters. Apart from the exporters so that the command line's help names them
without importing the plan."""

DEPLOYMENTS = {"k8s": "kubernetes", "slurm": "slurm"}
