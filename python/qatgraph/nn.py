"""The layer library, the digits models and training (the C++ nn/ folder).

    cfg = qatgraph.nn.TrainConfig()
    cfg.model = "mlp"
    cfg.qconfig = qatgraph.nn.QConfig.w8a8()
    data = qatgraph.nn.load_digits()
    train_set, test_set = qatgraph.nn.split_dataset(data, 0.2, seed=0)
    trainer = qatgraph.nn.train(cfg, train_set, test_set, epochs=5)
"""
from . import _core

_native = _core.nn
for _name in dir(_native):
    if not _name.startswith("_"):
        globals()[_name] = getattr(_native, _name)
__all__ = [n for n in dir(_native) if not n.startswith("_")] + ["train"]


def train(config, train_data, test_data, epochs, on_epoch=None):
    """Trains a fresh Trainer for `epochs` epochs and returns it (trainer.history holds the
    EpochMetrics). `on_epoch(metrics)` is called after each epoch."""
    trainer = _native.Trainer(config, train_data, test_data)
    for _ in range(epochs):
        metrics = trainer.train_epoch()
        if on_epoch is not None:
            on_epoch(metrics)
    return trainer
