# A torchtitan 0.3 config registry written for gplan's tests in the forms torchtitan's own registries use
# (torchtitan/models/<module>/config_registry.py: a Trainer.Config built per function, a variable assigned once,
# another function called and changed). torchtitan's module is the folder a registry sits in: the tests read a
# copy of this file from a folder named deepseek_v3, whose 16B flavor is gplan's bundled deepseek-v3-16b.

from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.components.quantization import (Float8GroupedExpertsConverter, Float8LinearConverter,
                                                 NVFP4LinearConverter)
from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.trainer import Trainer

from . import model_registry


def moe_16b() -> Trainer.Config:
    """FSDP over the ranks with ep 8 borrowed from them, per-op checkpointing by default, the loss in chunks; CUDA
    graphs off (ep's exchange syncs with the host: torchtitan refuses them, as its deepseek_v3_16b says)."""
    model_spec = model_registry("16B", attn_backend="flex")
    return Trainer.Config(
        loss=ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config()),
        hf_assets_path="./assets/hf/deepseek-moe-16b-base",
        model_spec=model_spec,
        training=TrainingConfig(local_batch_size=4, seq_len=4096, steps=1000, disable_cuda_graphs=True),
        parallelism=ParallelismConfig(pipeline_parallel_schedule="Interleaved1F1B", expert_parallel_degree=8),
        compile=CompileConfig(enable=True, components=["loss"]),
    )


def moe_16b_deepep_full_ac() -> Trainer.Config:
    config = moe_16b()
    config.model_spec = model_registry("16B", attn_backend="flex", moe_comm_backend="deepep")
    config.training.local_batch_size = 8
    config.activation_checkpoint = FullAC.Config()
    config.loss = CrossEntropyLoss.Config()
    return config


def moe_16b_two_chunks() -> Trainer.Config:
    config = moe_16b()
    config.loss = ChunkedLossWrapper.Config(num_chunks=2)
    config.activation_checkpoint = SelectiveAC.Config()
    return config


def moe_16b_computed_batch() -> Trainer.Config:
    config = moe_16b()
    config.training.local_batch_size = 2 * 4
    return config


def add_override(config: Trainer.Config) -> None:
    config.override.imports.append("my.override")


def moe_16b_changed_by_a_helper() -> Trainer.Config:
    config = moe_16b()
    add_override(config)
    return config


def moe_16b_changed_by_a_branch() -> Trainer.Config:
    config = moe_16b()
    if config.training.seq_len > 2048:
        config.training.local_batch_size = 2
    return config


def moe_16b_muon() -> Trainer.Config:
    config = moe_16b()
    config.optimizer = muon_optimizer(lr=3e-4)
    return config


def moe_16b_nvfp4() -> Trainer.Config:
    config = moe_16b()
    config.model_spec = model_registry("16B", converters=[NVFP4LinearConverter.Config()])
    return config


def moe_16b_ep1_graphed() -> Trainer.Config:
    """ep 1: torchtitan 0.3 captures the step in CUDA graphs, its default."""
    config = moe_16b()
    config.parallelism.expert_parallel_degree = 1
    config.training.disable_cuda_graphs = False
    return config


def moe_16b_graphed() -> Trainer.Config:
    """ep 8 with graphs left on: torchtitan's own check refuses it."""
    config = moe_16b()
    config.training.disable_cuda_graphs = False
    return config


def moe_16b_float8() -> Trainer.Config:
    """float8 in the linears and the routed experts' grouped GEMMs, as its deepseek_v3_671b_float8 converts them."""
    config = moe_16b()
    config.model_spec = model_registry("16B", attn_backend="flex", converters=[
        Float8LinearConverter.Config(filter_fqns=["lm_head", "router.gate"]), Float8GroupedExpertsConverter.Config()])
    return config


def moe_16b_float8_linears_only() -> Trainer.Config:
    """float8 in the linears alone: the routed experts stay BF16."""
    config = moe_16b()
    config.model_spec = model_registry("16B", attn_backend="flex",
                                       converters=[Float8LinearConverter.Config(filter_fqns=["lm_head"])])
    return config
