"""Every bad input: exit status 2, exactly one line on standard error, no traceback, no file left behind.

One table of config keys, files, checkpoints, run directories and command lines. Each row runs the
`psf` command line in this process; the rows marked MPI run on five MPI ranks as well, where the
line must still come once (from rank 0) and the job's status must be 2. They run one after another
in a warm pool job that stays up after each error (tests/mpi/pool.py); the rows of FRESH_JOBS, one
per way a run ends with its error (a config error before training, an error agreed inside it), run
as jobs of their own, where MPI is finalized and mpiexec itself must exit 2 with nothing but the line.
"""

from __future__ import annotations

import os
import shutil
import socket
from typing import Dict, List, NamedTuple, Tuple

import numpy as np
import pytest
import torch

from mpiutil import describe, run_mpi, run_psf
from psframework.cli import main
from psframework.rundir import LOCK_NAME
from test_data import idx_bytes, write_batch, write_cifar, write_mnist
from test_safety import RunsCode, snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "configs")


class Row(NamedTuple):
    """One bad input: the command line (templated), a phrase the error must hold, whether to run it under MPI."""

    argv: Tuple[str, ...]
    phrase: str
    mpi: bool = False


def train(*overrides: str, config: str = "{digits}", mpi: bool = False, phrase: str = "") -> Row:
    return Row(("train", config, "output.dir={out}", "output.progress=off", *overrides), phrase, mpi)


def sazd(*overrides: str, phrase: str = "", mpi: bool = True) -> Row:
    return train(*overrides, config="{sazd}", mpi=mpi, phrase=phrase)


ROWS: Dict[str, Row] = {
    # ---- config keys: types, notations, ranges
    "lr negative": train("train.lr=-1", phrase="train.lr: got -1.0, expected a positive number"),
    "lr word": train("train.lr=fast", phrase="train.lr: got 'fast', expected a number"),
    "lr inf": train("train.lr=.inf", phrase="train.lr: got inf, expected a finite number"),
    "lr nan": train("train.lr=.nan", phrase="train.lr: got nan, expected a finite number"),
    "lr 1e300": train("train.lr=1e300", phrase="train.lr: got 1e+300, expected 0.0..1000.0"),
    "lr -1e-3": train("train.lr=-1e-3", phrase="train.lr: got -0.001, expected a positive number"),
    "head lr inf": train("train.head_lr=.inf", phrase="train.head_lr: got inf, expected a finite number"),
    "momentum 1.5": train("train.momentum=1.5", phrase="train.momentum: got 1.5"),
    "nesterov without momentum": train("train.nesterov=true", "train.momentum=0", phrase="needs train.momentum > 0"),
    "nesterov maybe": train("train.nesterov=maybe", phrase="train.nesterov: got 'maybe', expected true or false"),
    "weight decay 2": train("train.weight_decay=2", phrase="train.weight_decay: got 2.0, expected 0.0..1.0"),
    "epochs 0": train("train.epochs=0", phrase="train.epochs: got 0, expected a positive integer"),
    "epochs 1e7": train("train.epochs=1e7", phrase="train.epochs: got 10000000, expected 1..1000000"),
    "max iterations 1e23": train("train.max_iterations=1e23",
                                 phrase="train.max_iterations: got 99999999999999991611392"),
    "max iterations 2.5": train("train.max_iterations=2.5",
                                phrase="train.max_iterations: got 2.5, expected an integer"),
    "train seed huge": train("train.seed=99999999999999999999",
                             phrase="train.seed: got 99999999999999999999, expected 0..4294967295"),
    "data seed -1": train("data.seed=-1", phrase="data.seed: got -1, expected 0..4294967295"),
    "checkpoint every -1": train("train.checkpoint_every=-1", phrase="train.checkpoint_every: got -1"),
    "eval every huge": train("train.eval_every=1e12",
                             phrase="train.eval_every: got 1000000000000, expected 0..1000000000"),
    "optimizer rmsprop": train("train.optimizer=rmsprop", phrase="train.optimizer: got 'rmsprop'"),
    "head optimizer rmsprop": train("train.head_optimizer=rmsprop", phrase="train.head_optimizer: got 'rmsprop'"),
    "schedule typo": train("train.lr_schedule=cosin", phrase="did you mean 'cosine'"),
    # ---- outputs and requeues
    "keep checkpoints 0": train("train.keep_checkpoints=0",
                                phrase="train.keep_checkpoints: got 0, expected 1..1000000000"),
    "max requeues -1": train("train.max_requeues=-1", phrase="train.max_requeues: got -1, expected 0..1000000"),
    "sweep max parallel 0": Row(("sweep", "{sazd}", "--slurm", "--dry-run", "--out", "{out}", "--max-parallel", "0"),
                                "psf sweep: --max-parallel: got 0, expected a positive number of array tasks"),
    "trace window reversed": train("output.trace=true", "output.trace_window=[9, 3]",
                                   phrase="output.trace_window: got [9, 3], expected [first, last] iterations"),
    "trace window beyond the run": train("output.trace=true", "output.trace_window=[10, 500]",
                                         "train.max_iterations=20",
                                         phrase="output.trace_window: got [10, 500], beyond the run's 20 iterations"),
    "trace iterations 0": train("output.trace=true", "output.trace_iterations=0",
                                phrase="output.trace_iterations: got 0, expected 1..1000000"),
    # ---- the training recipe
    "milestones not increasing": train("train.lr_schedule=multistep", "train.lr_milestones=[3, 2]",
                                       phrase="train.lr_milestones: got [3, 2], expected increasing epochs >= 1"),
    "milestones beyond the epochs": train("train.lr_schedule=multistep", "train.lr_milestones=[2, 9]",
                                          phrase="train.lr_milestones: got [2, 9], expected epochs below "
                                          "train.epochs=5"),
    "multistep without milestones": train("train.lr_schedule=multistep",
                                          phrase="train.lr_milestones: empty, expected the epochs"),
    "warm-up longer than the epochs": train("train.warmup=6", phrase="train.warmup: got 6 epochs, longer than"),
    "warm-up longer than the planned iterations": train("train.warmup=500", "train.warmup_unit=iterations",
                                                        "train.max_iterations=40", phrase="train.warmup: got 500 "
                                                        "iterations (500 optimizer steps of 1 iterations), longer "
                                                        "than the run's 220 optimizer steps"),
    "warm-up with onecycle": train("train.warmup=1", "train.lr_schedule=onecycle",
                                   phrase="train.warmup: got 1 with lr_schedule onecycle, expected 0"),
    "gamma 0": train("train.lr_gamma=0", phrase="train.lr_gamma: got 0.0, expected 0 < gamma <= 1"),
    "gamma 1.5": train("train.lr_gamma=1.5", phrase="train.lr_gamma: got 1.5, expected 0 < gamma <= 1"),
    "accumulate 0": train("train.accumulate=0",
                          phrase="train.accumulate: got 0, expected a positive number of micro-batches"),
    "accumulate and an odd length": train("train.accumulate=2", "train.max_iterations=7",
                                          phrase="train.max_iterations: got 7, expected a multiple of "
                                          "train.accumulate=2"),
    "micro-batch below the workers": sazd("data.batch_size=2", "train.accumulate=8", "scheme=ps",
                                          phrase="data.batch_size: got 2 with code.n=4 workers, expected at least "
                                          "one sample per worker"),
    "label smoothing 1": train("train.label_smoothing=1",
                               phrase="train.label_smoothing: got 1.0, expected 0 <= x < 1"),
    "label smoothing negative": train("train.label_smoothing=-0.1",
                                      phrase="train.label_smoothing: got -0.1, expected 0 <= x < 1"),
    "precision fp16 on the cpu": train("train.precision=fp16",
                                       phrase="train.precision: got fp16 with device 'cpu', expected bf16 or fp32"),
    "precision fp16 under mpi": sazd("train.precision=fp16", phrase="train.precision: got fp16 with device 'cpu'"),
    "loss scale power 128": train("train.loss_scale_power=128", phrase="train.loss_scale_power: got 128, expected "
                                  "0..127"),
    "loss scale typo": train("train.loss_scale=dynamc", phrase="did you mean 'dynamic'"),
    "precision typo": train("train.precision=bf61", phrase="train.precision: got 'bf61', expected one of fp32"),
    "augment a non-image": train("data.augment=crop-flip", "data.dataset=synthetic", "data.synthetic.height=1",
                                 "data.synthetic.width=16", "model.name=resnet20",
                                 phrase="data.augment: got 'crop-flip' for data.dataset 'synthetic', whose samples "
                                 "are 3x1x16"),
    "augment flip 2": train("data.augment_flip=2", phrase="data.augment_flip: got 2.0, expected a probability"),
    "normalize fixed without values": train("data.normalize=fixed", phrase="data.mean, data.std: got None and None"),
    "checkpoint other recipe": train("train.resume={ckpt}", "train.lr_schedule=constant", "train.accumulate=2",
                                     "train.precision=bf16", "train.label_smoothing=0.1",
                                     phrase="train.accumulate 1 -> 2; train.label_smoothing 0.0 -> 0.1; "
                                     "train.precision 'fp32' -> 'bf16'"),
    "unknown section": train("trian.lr=0.1", phrase="did you mean 'train'"),
    "unknown key": train("train.lrr=0.1", phrase="did you mean 'train.lr'"),
    "section as value": train("data=3", phrase="data: got 3, expected a mapping"),
    "resume force word": train("train.resume_force=sometimes", phrase="train.resume_force: got 'sometimes'"),
    "preempt on KILL": train("train.preempt_signal=KILL", phrase="train.preempt_signal: got 'KILL', expected a signal"),
    "preempt on nothing": train("train.preempt_signal=SIGNOPE", phrase="train.preempt_signal: got 'SIGNOPE'"),
    "batch 0": train("data.batch_size=0", phrase="data.batch_size: got 0, expected a positive integer"),
    "batch 2.5": train("data.batch_size=2.5", phrase="data.batch_size: got 2.5, expected an integer"),
    "batch 1e9": train("scheme=sazd", "data.batch_size=1000000000",
                       phrase="data.batch_size: got 1000000000, expected 1..10000000"),
    "batch beyond the data": train("data.batch_size=5000",
                                   phrase="data.batch_size: got 5000, larger than the 1438 training samples"),
    "test batch 0": train("data.test_batch_size=0", phrase="data.test_batch_size: got 0"),
    "drop last maybe": train("data.drop_last=maybe", phrase="data.drop_last: got 'maybe'"),
    "dataset typo": train("data.dataset=mnits", phrase="did you mean 'mnist'"),
    "mnist without root": train("data.dataset=mnist", phrase="data.root: dataset mnist needs data.root"),
    "synthetic one class": train("data.dataset=synthetic", "data.synthetic.classes=1",
                                 phrase="data.synthetic.classes: got 1, expected >= 2"),
    "synthetic huge image": train("data.dataset=synthetic", "data.synthetic.height=100000",
                                  phrase="data.synthetic.height: got 100000, expected 1..4096"),
    "synthetic noise -1": train("data.dataset=synthetic", "data.synthetic.noise=-1",
                                phrase="data.synthetic.noise: got -1.0, expected 0.0..1000000.0"),
    "model typo": train("model.name=resnet", phrase="model.name: got 'resnet'"),
    "input size 4": train("model.input_size=4", phrase="model lenet5: input size 4 is too small for the conv stack"),
    "input size 100000": train("model.input_size=100000", phrase="model.input_size: got 100000, expected 4..4096"),
    "channels too many": train("scheme=sazd", "model.channels=[100000,100000]",
                               phrase="model.channels: got 100000, expected 1..65536"),
    "channels count": train("model.channels=[8]", phrase="model.channels: got 1 values [8], the model has 2"),
    "model factory does not import": train("model.name=nosuch.models:net",
                                           phrase="model.name: 'nosuch.models:net' does not import: ModuleNotFound"),
    "model file missing": train("model.name=no/such/file.py:net", phrase="does not import: FileNotFoundError"),
    "model factory not a module": train("model.name=psframework.imports:is_import_path", "model.args.text=x",
                                        phrase="returned a bool, expected a torch.nn.Module"),
    "model factory fails": train("model.name={root}/examples/small_resnet.py:Residual",
                                 phrase="model.name: factory Residual failed with TypeError"),
    "model output not the classes": train("model.name={root}/examples/small_resnet.py:small_resnet",
                                          "model.args.num_classes=7",
                                          phrase="returns (7,) scores per sample, expected (10,)"),
    "model without convolutions": train("scheme=sazd", "model.name=torch.nn:Flatten", "data.dataset=synthetic",
                                        "data.synthetic.height=1", "data.synthetic.width=10",
                                        "data.synthetic.channels=1",
                                        phrase="model torch.nn:Flatten has no convolution that scheme sazd can code"),
    "split at missing": train("scheme=stanza", "model.split_at=classifier",
                              phrase="model.split_at: got 'classifier', model lenet5 has no module"),
    "model args for built-in": train("model.args.width=3",
                                     phrase="built-in model lenet5 takes its options as model.channels"),
    "channels empty": train("model.channels=[]", phrase="model.channels: got [], expected a list of positive"),
    "channels as number": train("model.channels=8", phrase="model.channels: got 8, expected a list of an integer"),
    "fc zero": train("model.fc=[0]", phrase="model.fc: got [0], expected a list of positive widths"),
    "dropout 1": train("model.dropout=1.0", phrase="model.dropout: got 1.0"),
    "memory of the batch": train("data.batch_size=1000000", phrase="memory: a server rank of scheme reference needs"),
    "memory of the layers": train("model.channels=[60000,60000]", phrase="parameters 1007.9 GiB"),
    "device gpu": train("device=gpu", phrase="device: got 'gpu'"),
    "progress loud": train("output.progress=loud", phrase="output.progress: got 'loud'"),
    "overwrite word": train("output.overwrite=please", phrase="output.overwrite: got 'please', expected true or false"),
    "name with slash": train("name=a/b", phrase="name: got 'a/b', expected a non-empty name without '/'"),
    "name dot dot": train("name=..", phrase="name: got '..'"),
    "name empty": train("name=", phrase="name: got ''"),
    "scheme typo": train("scheme=sazdd", phrase="did you mean 'sazd'"),
    "k above n": train("scheme=sazd", "code.k=5", "code.n=4", phrase="code.k: got k=5 > n=4"),
    "k zero": train("scheme=sazd", "code.k=0", phrase="code.k: got 0"),
    "n huge": train("scheme=sazd", "code.n=100000", "code.k=2", phrase="code.n: got 100000, expected 1..1024"),
    "uncoded k": train("scheme=uncoded", "code.k=3", phrase="scheme uncoded needs k = n"),
    "sazd with adam": train("scheme=sazd", "train.optimizer=adam", phrase="linear optimizer"),
    "backup on coded": train("scheme=sazd", "train.backup_workers=1", phrase="backup workers belong"),
    "backup all": train("scheme=ps", "train.backup_workers=4", phrase="expected 0 <= backup_workers < n"),
    "ps small batch": train("scheme=ps", "data.batch_size=3", phrase="data.batch_size: got 3 with code.n=4 workers"),
    "straggler rank": train("scheme=sazd", "stragglers.ranks=[9]", phrase="got rank 9, expected worker ranks 1..4"),
    "straggler ranks number": train("stragglers.ranks=3", phrase="stragglers.ranks: got 3, expected a list"),
    "straggler fixed no ranks": train("stragglers.model=fixed", phrase="stragglers.ranks: got none"),
    "straggler factor inf": train("stragglers.factor=.inf", phrase="stragglers.factor: got inf, expected a finite"),
    "straggler seed -3": train("stragglers.seed=-3", phrase="stragglers.seed: got -3"),
    "freeze duty": train("stragglers.model=freeze", "stragglers.ranks=[1]", "stragglers.duty=1.5",
                         phrase="stragglers.duty: got 1.5"),
    "freeze pause": train("stragglers.model=freeze", "stragglers.ranks=[1]", "stragglers.pause_s=0",
                          phrase="stragglers.pause_s: got 0.0"),
    "threads 100000": train("comm.threads=100000", phrase="comm.threads: got 100000, expected 0..1024"),
    "timeout inf": train("comm.timeout_s=.inf", phrase="comm.timeout_s: got inf, expected a finite number"),
    "timeout 0": train("comm.timeout_s=0", phrase="comm.timeout_s: got 0.0"),
    "window 0": train("comm.window=0", phrase="comm.window: got 0, expected 1..16"),
    "detach after 0": train("comm.detach_after=0", phrase="comm.detach_after: got 0"),
    "bandwidth 0": train("comm.emulate.bandwidth_gbps=0", phrase="comm.emulate.bandwidth_gbps: got 0.0"),
    "latency huge": train("comm.emulate.latency_us=1e12", phrase="comm.emulate.latency_us: got 1000000000000.0"),
    "override without value": train("train.lr", phrase="override 'train.lr': expected key=value"),
    "override empty key": train("train..lr=3", phrase="override key 'train..lr': expected dotted names"),
    # ---- config files
    "config missing": Row(("train", "{tmp}/none.yaml"), "config file '{tmp}/none.yaml' does not exist"),
    "config directory": Row(("train", "{tmp}"), "config file '{tmp}' is a directory, expected a YAML file"),
    "config not utf-8": Row(("train", "{latin1}"), "not UTF-8 text (byte 0xe9 at offset 9)"),
    "config not yaml": Row(("train", "{broken}"), "line 3: not valid YAML"),
    "config a list": Row(("train", "{listed}"), "expected a mapping of keys at the top level"),
    "config duplicate section": Row(("train", "{twice}"), "line 4: duplicate key 'train' (first given on line 1)"),
    "config duplicate key": Row(("train", "{twice_inner}"), "line 3: duplicate key 'lr' (first given on line 2)"),
    "config NUL in name": Row(("train", "{nul}"), "name: got 'a\\x00b', expected text without NUL characters"),
    "config unknown key": Row(("train", "{unknown}"), "unknown key 'train.lerning_rate'"),
    # ---- data files and paths
    "data root missing": train("data.dataset=mnist", "data.root={tmp}/nothing",
                               phrase="data.root: directory '{tmp}/nothing' does not exist"),
    "data root a file": train("data.dataset=mnist", "data.root={digits}",
                              phrase="is a file, expected the directory of the dataset's files"),
    "mnist files missing": train("data.dataset=mnist", "data.root={empty}", phrase="missing file {empty}/train-images"),
    "mnist NaN pixels": train("data.dataset=mnist", "data.root={nan_mnist}",
                              phrase="{nan_mnist}/train-images-idx3-ubyte: 1 non-finite pixel values"),
    "mnist label 1.7": train("data.dataset=mnist", "data.root={float_labels}",
                             phrase="{float_labels}/train-labels-idx1-ubyte: 1 non-integer labels"),
    "mnist truncated": train("data.dataset=mnist", "data.root={truncated_mnist}", phrase="truncated"),
    "cifar labels strings": train("data.dataset=cifar10", "data.root={cifar_str}", phrase="is str, not an integer"),
    "cifar labels dict": train("data.dataset=cifar10", "data.root={cifar_dict}", phrase="labels are a dict"),
    "cifar label 1.7": train("data.dataset=cifar10", "data.root={cifar_float}", phrase="label 1.7 at index 1"),
    "cifar batch missing": train("data.dataset=cifar10", "data.root={empty}", phrase="missing file"),
    "output below a file": train("output.dir={digits}/runs", phrase="lies below the file"),
    # ---- checkpoints
    "checkpoint runs code": train("train.resume={evil}", phrase="refused, loading it could run code"),
    "checkpoint missing": train("train.resume={tmp}/none.pt",
                                phrase="a checkpoint file '{tmp}/none.pt' does not exist"),
    "checkpoint a directory": train("train.resume={tmp}", phrase="is a directory, expected a checkpoint file"),
    "checkpoint a text file": train("train.resume={digits}", phrase="not a file torch.save wrote"),
    "checkpoint truncated": train("train.resume={truncated_ckpt}", phrase="failed reading zip archive"),
    "checkpoint a tensor": train("train.resume={tensor_ckpt}", phrase="found format 'Tensor'"),
    "checkpoint old format": train("train.resume={old_ckpt}", phrase="of format 3 (found format 2)"),
    "checkpoint without entries": train("train.resume={hollow_ckpt}", phrase="lacks an entry"),
    "checkpoint other lr and batch": train("train.resume={ckpt}", "train.lr_schedule=constant", "train.lr=0.1",
                                           "data.batch_size=16",
                                           phrase="data.batch_size 32 -> 16; train.lr 0.02 -> 0.1"),
    "checkpoint other model": train("train.resume={ckpt}", "train.lr_schedule=constant", "model.fc=[32]",
                                    phrase="model.fc None -> [32]; model.shapes (the layers' shapes)"),
    "checkpoint other schedule": train("train.resume={ckpt}", phrase="train.lr_schedule 'constant' -> 'cosine'"),
    "checkpoint beyond plan": train("train.resume={ckpt}", "train.lr_schedule=constant", "train.max_iterations=2",
                                    phrase="holds iteration 4, beyond the 2 iterations"),
    # ---- run directories
    "finished run": train("name=done", phrase="already holds a finished run (summary.json)"),
    "unfinished run": train("name=stopped", phrase="already holds an unfinished run with a checkpoint"),
    "run in use": train("name=busy", phrase="is in use by pid"),
    # ---- command lines
    "no arguments": Row(("train",), "psf train: the following arguments are required"),
    "no command": Row(("launch",), "invalid choice: 'launch'"),
    "unknown option": Row(("check", "{digits}", "--bogus"), "unrecognized arguments: --bogus"),
    "world size not a number": Row(("check", "{sazd}", "--world-size", "x"), "invalid int value: 'x'"),
    "world size mismatch": Row(("check", "{sazd}", "--world-size", "4"), "world size 4 does not fit code.n=4"),
    "check machine without a GPU": Row(("check", "{digits}", "--machine", "device=cuda"),
                                       "device: got 'cuda' but torch sees no CUDA device"),
    "check machine without data": Row(("check", "--machine", "{digits}", "data.dataset=mnist",
                                       "data.root={tmp}/nothing"),
                                      "data.root: directory '{tmp}/nothing' does not exist"),
    "model info bad model": Row(("model-info", "{digits}", "model.name=vgg"), "model.name: got 'vgg'"),
    # ---- under MPI: the same one line from rank 0, exit 2 for the whole job
    "mpi lr": sazd("train.lr=-1", phrase="train.lr: got -1.0"),
    "mpi world size": Row(("train", "{stanza}", "code.n=3", "output.dir={out}"), "world size 5 does not fit code.n=3",
                          True),
    "mpi checkpoint runs code": sazd("train.resume={evil}", phrase="refused, loading it could run code"),
    "mpi checkpoint of another scheme": sazd("train.resume={ckpt}", phrase="scheme 'reference' -> 'sazd'"),
    "mpi sazd checkpoint other lr and batch": sazd("train.resume={sazd_ckpt}", "train.lr=0.1", "data.batch_size=16",
                                                   phrase="data.batch_size 32 -> 16; train.lr 0.02 -> 0.1"),
    "mpi cuda-aware on a plain MPI": sazd("comm.cuda_aware=true", phrase="comm.cuda_aware: got true, but the MPI "
                                          "library is not CUDA-aware (MPIX_Query_cuda_support()=0)"),
    "mpi memory": sazd("data.batch_size=1000000", phrase="memory: a server rank of scheme sazd needs"),
    "mpi finished run": sazd("name=done", phrase="already holds a finished run"),
    "mpi run in use": sazd("name=busy", phrase="is in use by pid"),
    "mpi input size": sazd("model.input_size=4", phrase="input size 4 is too small"),
    "mpi data on every rank": train("data.dataset=mnist", "data.root={empty}", config="{stanza}", mpi=True,
                                    phrase="missing file {empty}/train-images"),
    "mpi cifar labels": train("data.dataset=cifar10", "data.root={cifar_dict}", config="{stanza}", mpi=True,
                              phrase="labels are a dict"),
}

if not torch.cuda.is_available():  # where a GPU is visible these are not bad inputs
    ROWS["device cuda without a GPU"] = train("device=cuda", phrase="device: got 'cuda' but torch sees no CUDA "
                                              "device on rank 0 (host " + socket.gethostname() + ")")
    ROWS["mpi device cuda without a GPU"] = sazd("device=cuda", phrase="sees no CUDA device on rank 0 (host")


class Files:
    """Build the files a row names, on demand, below one temporary directory."""

    def __init__(self, tmp_dir, checkpoint: str) -> None:
        self.tmp_dir, self.checkpoint = tmp_dir, checkpoint
        self.made: Dict[str, str] = {}

    def path(self, name: str) -> str:
        if name not in self.made:
            self.made[name] = str(getattr(self, name)())
        return self.made[name]

    def fill(self, text: str) -> str:
        names = {part.split("}")[0] for part in text.split("{")[1:]}
        return text.format(**{name: self.path(name) for name in names})

    def tmp(self):
        return self.tmp_dir

    def root(self):
        return ROOT

    def out(self):
        return self.tmp_dir / "out"

    def digits(self):
        return os.path.join(CONFIGS, "digits_reference.yaml")

    def sazd(self):
        return os.path.join(CONFIGS, "digits_sazd.yaml")

    def stanza(self):
        return os.path.join(CONFIGS, "digits_stanza.yaml")

    def text(self, name: str, data: bytes):
        path = self.tmp_dir / name
        path.write_bytes(data)
        return path

    def latin1(self):
        return self.text("latin1.yaml", "name: caf\u00e9\n".encode("latin-1"))

    def broken(self):
        return self.text("broken.yaml", b"train:\n  lr: [1, 2\n")

    def listed(self):
        return self.text("listed.yaml", b"- 1\n- 2\n")

    def twice(self):
        return self.text("twice.yaml", b"train:\n  lr: 0.1\nname: x\ntrain:\n  epochs: 2\n")

    def twice_inner(self):
        return self.text("twice_inner.yaml", b"train:\n  lr: 0.1\n  lr: 0.2\n")

    def nul(self):
        return self.text("nul.yaml", b'name: "a\\0b"\n')

    def unknown(self):
        return self.text("unknown.yaml", b"train:\n  lerning_rate: 0.1\n")

    def folder(self, name: str):
        path = self.tmp_dir / name
        path.mkdir()
        return path

    def empty(self):
        return self.folder("empty")

    def nan_mnist(self):
        root = self.folder("nan_mnist")
        write_mnist(root)
        images = np.zeros((20, 28, 28), np.float32)
        images[3, 4, 5] = np.nan
        (root / "train-images-idx3-ubyte").write_bytes(idx_bytes(images, 0x0D))
        return root

    def float_labels(self):
        root = self.folder("float_labels")
        write_mnist(root)
        labels = np.zeros(20, np.float32)
        labels[2] = 1.7
        (root / "train-labels-idx1-ubyte").write_bytes(idx_bytes(labels, 0x0D))
        return root

    def truncated_mnist(self):
        root = self.folder("truncated_mnist")
        write_mnist(root)
        path = root / "t10k-images-idx3-ubyte"
        path.write_bytes(path.read_bytes()[:-10])
        return root

    def cifar(self, name: str, labels):
        root = self.folder(name)
        directory = write_cifar(root)
        write_batch(directory / "data_batch_2", labels=labels)
        return root

    def cifar_str(self):
        return self.cifar("cifar_str", ["1", "2", "3"])

    def cifar_dict(self):
        return self.cifar("cifar_dict", {0: 1, 1: 2, 2: 3})

    def cifar_float(self):
        return self.cifar("cifar_float", [1, 1.7, 2])

    def ckpt(self):
        return self.checkpoint

    def sazd_ckpt(self):
        """Train sazd for 3 iterations under mpiexec; return its checkpoint."""
        out = self.tmp_dir / "sazd-runs"
        proc = run_psf(5, ["train", self.sazd(), f"output.dir={out}", "name=coded", "train.max_iterations=3",
                           "output.progress=off"], timeout=120)
        assert proc.returncode == 0, describe(proc)
        return out / "coded" / "checkpoint.pt"

    def evil(self):
        path = self.tmp_dir / "evil.pt"
        torch.save({"format": 3, "x": RunsCode(str(self.tmp_dir / "ran"))}, path)
        return path

    def truncated_ckpt(self):
        with open(self.checkpoint, "rb") as fh:
            return self.text("truncated.pt", fh.read()[:300])

    def saved(self, name: str, obj):
        path = self.tmp_dir / name
        torch.save(obj, path)
        return path

    def tensor_ckpt(self):
        return self.saved("tensor.pt", torch.zeros(3))

    def old_ckpt(self):
        return self.saved("old.pt", {"format": 2, "iteration": 4, "model": {}})

    def hollow_ckpt(self):
        return self.saved("hollow.pt", {"format": 3})


@pytest.fixture(scope="module")
def reference_checkpoint(tmp_path_factory) -> str:
    """A checkpoint of 4 reference iterations (constant learning rate) on digits."""
    out = tmp_path_factory.mktemp("reference")
    status = main(["train", os.path.join(CONFIGS, "digits_reference.yaml"), f"output.dir={out}", "name=ref",
                   "train.max_iterations=4", "train.lr_schedule=constant", "output.progress=off"])
    assert status == 0
    return str(out / "ref" / "checkpoint.pt")


def prepare_run_directories(out, checkpoint: str) -> None:
    """Give the output directory a finished run, a stopped run and a run in use by this process."""
    done = out / "done"
    shutil.copytree(os.path.dirname(checkpoint), done)
    stopped = out / "stopped"
    stopped.mkdir()
    for name in ("config.yaml", "checkpoint.pt"):
        shutil.copy(done / name, stopped / name)
    (stopped / "metrics.jsonl.partial").write_text('{"iteration": 1}\n')
    busy = out / "busy"
    busy.mkdir()
    (busy / LOCK_NAME).write_text(f"{socket.gethostname()} {os.getpid()} 2026-01-01T00:00:00\n")


def setup_row(tmp_path, checkpoint: str, row: Row) -> Tuple[Files, List[str], str, Dict[str, bytes]]:
    files = Files(tmp_path, checkpoint)
    out = tmp_path / "out"
    out.mkdir()
    prepare_run_directories(out, checkpoint)
    argv = [files.fill(arg) for arg in row.argv]
    return files, argv, files.fill(row.phrase), snapshot(out)


def check_one_line(status: int, stderr: str, phrase: str, where: str) -> None:
    lines = stderr.strip().splitlines()
    assert status == 2, f"{where}: exit status {status}, expected 2\n{stderr}"
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, f"{where}: {len(lines)} lines on standard error, expected 1:\n{stderr}"
    assert lines[0].startswith("psf: error: "), lines[0]
    assert phrase in lines[0], f"{where}: {phrase!r} not in {lines[0]!r}"


def test_the_table_has_at_least_80_rows():
    assert len(ROWS) >= 80
    assert sum(row.mpi for row in ROWS.values()) >= 10


@pytest.mark.parametrize("name", sorted(n for n, row in ROWS.items() if not row.mpi))
def test_a_bad_input_gives_one_line_and_status_2(name, tmp_path, reference_checkpoint, capsys):
    row = ROWS[name]
    files, argv, phrase, before = setup_row(tmp_path, reference_checkpoint, row)
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's usage errors exit
        status = exc.code
    check_one_line(status, capsys.readouterr().err, phrase, "in one process")
    assert snapshot(tmp_path / "out") == before, "the run left files behind or changed some"
    assert not (tmp_path / "ran").exists(), "a checkpoint ran code"


# Run as jobs of their own: one row per way a run ends with its error line (a config error before
# training, an error agreed inside it); the rest share one pool job.
FRESH_JOBS = {"mpi lr", "mpi memory"}


@pytest.mark.parametrize("name", sorted(n for n, row in ROWS.items() if row.mpi))
def test_a_bad_input_under_mpi_gives_one_line_and_status_2(name, tmp_path, reference_checkpoint):
    row = ROWS[name]
    files, argv, phrase, before = setup_row(tmp_path, reference_checkpoint, row)
    if name in FRESH_JOBS:
        proc, where = run_mpi(5, ["-m", "psframework", *argv], timeout=120), "under mpiexec"
    else:
        proc, where = run_psf(5, argv, timeout=120, keep_mpi=True), "in a pool job"
    check_one_line(proc.returncode, proc.stderr, phrase, f"{where}\n{describe(proc)}")
    assert snapshot(tmp_path / "out") == before, "the run left files behind or changed some"
    assert not (tmp_path / "ran").exists(), "a checkpoint ran code"
