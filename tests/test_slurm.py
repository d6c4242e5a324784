"""The sbatch script of docs/train.md on a real single-node SLURM cluster (Debian's slurmctld, slurmd and munge,
started and stopped by the test, as root): preempted twice in the middle of an epoch, first by the signal the time
limit sends (the script requeues itself), then by the scheduler (``scontrol requeue``), the job finishes the run with
the same epochs and weights as an uninterrupted one and is not requeued again. Skipped with the reason where the
daemons cannot start (not root, packages missing: ``apt-get install slurmctld slurmd munge``)."""
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

from tcnn.train import launch

from imagegen import make_image_folder
from test_train import _free_port, assert_same_weights, load, metrics, same_numbers

pytestmark = pytest.mark.usefixtures('one_thread')  # small models on a shared 2-core machine (conftest.py)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAEMONS = ('munged', 'slurmctld', 'slurmd')
CLIENTS = ('sbatch', 'scontrol', 'scancel', 'squeue', 'sinfo')
# 200 training images / batch 4 at 64 px: an epoch lasts about 5 s on a quiet 2-core machine (at 32 px 1.5 s, which
# the log's output buffering and scancel's latency could overrun), long enough to preempt in the middle of it
EPOCHS, UPDATES = 3, 50
TRAIN_ARGS = ['--model', 'demo_resnet10', '--no-pretrained', '--epochs', str(EPOCHS), '--batch-size', '4',
              '--img-size', '64', '--workers', '0', '--lr', '1e-3', '--gating-lr', '1.0', '--set', 'warmup_epochs=1',
              '--set', 'scale_lr=false', '--device', 'cpu']  # with the progress bar: it shows an epoch under way


def sbatch_script():
    """The sbatch script of docs/train.md, verbatim."""
    with open(os.path.join(REPO, 'docs', 'train.md')) as f:
        blocks = re.findall(r'```bash\n(#!/bin/bash\n# train\.sbatch.*?)```', f.read(), flags=re.S)
    assert len(blocks) == 1, 'docs/train.md must hold one train.sbatch script'
    return blocks[0]


def test_the_docs_script_is_complete():
    script = sbatch_script()
    for needed in ('#SBATCH --signal=TERM@', '#SBATCH --requeue', 'srun ', 'torchrun --nnodes "$SLURM_NNODES"',
                   '--rdzv-backend c10d', '--resume auto', 'scontrol requeue "$SLURM_JOB_ID"', 'status.json'):
        assert needed in script, needed
    subprocess.run(['bash', '-n'], input=script, text=True, check=True)  # valid bash


class Cluster:
    """A one-node SLURM cluster under ``root``: munged, slurmctld and slurmd in the foreground, state, spool, logs
    and the munge key there too, ports chosen free."""

    def __init__(self, root):
        self.root = root
        self.procs = []
        self.env = dict(os.environ, SLURM_CONF=os.path.join(root, 'slurm.conf'))

    def path(self, name):
        return os.path.join(self.root, name)

    def start(self):
        for folder in ('state', 'spool'):
            os.makedirs(self.path(folder))
        with open(self.path('munge.key'), 'wb') as f:
            f.write(os.urandom(1024))
        os.chmod(self.path('munge.key'), 0o600)
        host = socket.gethostname().split('.')[0]
        cpus = min(2, os.cpu_count() or 1)
        with open(self.env['SLURM_CONF'], 'w') as f:
            f.write(f"""ClusterName=tcnntest
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={self.path('munge.sock')},cred_expire=5
CredType=cred/munge
StateSaveLocation={self.path('state')}
SlurmdSpoolDir={self.path('spool')}
SlurmctldPidFile={self.path('slurmctld.pid')}
SlurmdPidFile={self.path('slurmd.pid')}
SlurmctldLogFile={self.path('slurmctld.log')}
SlurmdLogFile={self.path('slurmd.log')}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobRequeue=1
ReturnToService=2
MpiDefault=none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
KillWait=120
NodeName={host} CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
        self._daemon(['munged', '-F', '-f', f'--socket={self.path("munge.sock")}',
                      f'--key-file={self.path("munge.key")}', f'--log-file={self.path("munged.log")}',
                      f'--pid-file={self.path("munged.pid")}', f'--seed-file={self.path("munged.seed")}'],
                     ready=lambda: os.path.exists(self.path('munge.sock')))
        self._daemon(['slurmctld', '-D', '-c', '-f', self.env['SLURM_CONF']],
                     ready=lambda: self.run('scontrol', 'ping', check=False).returncode == 0)
        self._daemon(['slurmd', '-D', '-f', self.env['SLURM_CONF']],
                     ready=lambda: self.run('sinfo', '-h', '-o', '%T', check=False).stdout.strip() == 'idle')

    def _daemon(self, cmd, ready, timeout=60):
        log = open(self.path(f'{cmd[0]}.out'), 'w')
        proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.procs.append(proc)
        deadline = time.monotonic() + timeout
        while not ready():
            if proc.poll() is not None:
                pytest.skip(f'{cmd[0]} cannot start here (exit code {proc.returncode}): {self.logs(cmd[0])}')
            assert time.monotonic() < deadline, f'{cmd[0]} did not come up: {self.logs(cmd[0])}'
            time.sleep(0.2)

    def logs(self, name, chars=2000):
        text = ''
        for suffix in ('.out', '.log'):
            if os.path.isfile(self.path(name + suffix)):
                with open(self.path(name + suffix), errors='replace') as f:
                    text += f.read()[-chars:]
        return text

    def run(self, *cmd, check=True):
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, check=check, timeout=60)

    def job(self, job_id):
        """``scontrol show job`` as a dict (``JobState``, ``Restarts``, ``ExitCode``, ...)."""
        out = self.run('scontrol', 'show', 'job', '-o', job_id).stdout
        return dict(re.findall(r'(\w+)=(\S*)', out))

    def stop(self):
        """Cancel every job, wait for their processes to end, then stop the daemons (slurmd, slurmctld, munged)."""
        if self.procs and self.procs[-1].poll() is None:
            self.run('scancel', '--user=root', check=False)
            deadline = time.monotonic() + 120
            while self.run('squeue', '-h', check=False).stdout.strip() and time.monotonic() < deadline:
                time.sleep(0.5)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip('the SLURM daemons run as root here (SlurmUser=root): run the tests as root')
    missing = [name for name in DAEMONS + CLIENTS if shutil.which(name) is None]
    if missing:
        pytest.skip(f'SLURM is not installed ({", ".join(missing)} missing): apt-get install slurmctld slurmd munge')
    cluster = Cluster(str(tmp_path_factory.mktemp('slurm')))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


ENDED = ('COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL', 'OUT_OF_MEMORY', 'BOOT_FAIL', 'DEADLINE')


def wait_for(predicate, cluster, job_id, what, log, timeout=300):
    """Poll ``predicate`` until it holds; fail at once if the job ends on the way."""
    deadline = time.monotonic() + timeout
    while not predicate():
        job = cluster.job(job_id)
        assert job['JobState'] not in ENDED, f'the job ended waiting for {what}: {job}\n{log()[-3000:]}'
        assert time.monotonic() < deadline, f'timed out waiting for {what}: {job}\n{log()[-3000:]}'
        time.sleep(0.1)


def test_preempted_job_requeues_until_the_run_is_finished(cluster, tmp_path):
    data = make_image_folder(str(tmp_path / 'data'), num_classes=2, train_per_class=100, val_per_class=2, size=32)
    straight, run, log = tmp_path / 'straight', tmp_path / 'run', tmp_path / 'job.log'
    assert launch.main(['--recipe', 't_resnet50_rs', '--data', data, '--output', str(straight), *TRAIN_ARGS]) == 0

    script = tmp_path / 'train.sbatch'
    script.write_text(sbatch_script())
    env = dict(cluster.env, RECIPE='t_resnet50_rs', DATA=data, OUT=str(run), GPUS_PER_NODE='1',
               TRAIN_ARGS=' '.join(TRAIN_ARGS), MASTER_PORT=str(_free_port()), HF_HUB_OFFLINE='1',
               OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1', PYTHONPATH=REPO,
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ['PATH'])
    # the script's resources, shrunk to this machine (command-line options override its #SBATCH lines)
    job_id = subprocess.run(['sbatch', '--parsable', '--nodes=1', '--gpus-per-node=0', '--cpus-per-task=1',
                             '--time=30', f'--output={log}', f'--chdir={tmp_path}', str(script)],
                            env=env, capture_output=True, text=True, check=True).stdout.strip()

    def job_log():
        return log.read_text() if log.exists() else ''

    def into_epoch(epoch):
        """Wait until the current start of the job is about 40% into ``epoch`` (1-based; epoch ``epoch - 1`` must
        be in metrics.jsonl), timed from the last epoch's duration. The log cannot tell: srun passes a task's output
        on line by line, and a progress bar ends its line only when its epoch ends."""
        wait_for(lambda: (run / 'metrics.jsonl').is_file() and len(metrics(run)) >= epoch - 1, cluster, job_id,
                 f'epoch {epoch - 1} to end', job_log)
        time.sleep(0.4 * metrics(run)[-1]['epoch_time_s'])

    def restarts():
        return int(cluster.job(job_id)['Restarts'])

    # 1. the time limit's signal to the job steps in epoch 2: the script finds the run preempted and requeues it
    into_epoch(2)
    cluster.run('scancel', '--signal=TERM', job_id)
    wait_for(lambda: restarts() == 1, cluster, job_id, 'the script to requeue the job', job_log)
    assert 'stopped by SIGTERM in epoch 2 after update' in job_log(), job_log()[-3000:]
    assert re.search(r'torchrun exit code \d+, run preempted', job_log()), job_log()[-3000:]

    # 2. the scheduler preempts the second start in epoch 3 (signals every process of the job and requeues it)
    into_epoch(3)
    cluster.run('scontrol', 'requeue', job_id)
    wait_for(lambda: restarts() == 2, cluster, job_id, 'the scheduler to requeue the job', job_log)

    # 3. the third start finishes the run; the script ends the job instead of requeueing it
    deadline = time.monotonic() + 300
    while cluster.job(job_id)['JobState'] not in ENDED:
        assert time.monotonic() < deadline, f'timed out waiting for the job to end\n{job_log()[-3000:]}'
        time.sleep(0.2)
    job, text = cluster.job(job_id), job_log()
    assert job['JobState'] == 'COMPLETED' and job['ExitCode'] == '0:0' and job['Restarts'] == '2', (job, text[-3000:])
    assert [int(n) for n in re.findall(rf'job {job_id} start (\d+)', text)] == [0, 1, 2], text[-3000:]
    for epoch in (2, 3):  # both starts after a preemption continued inside an epoch
        assert re.search(rf'resuming in epoch {epoch}/3 after [1-9]\d* of {UPDATES} updates', text), text[-3000:]
    assert 'torchrun exit code 0, run finished' in text, text[-3000:]
    assert same_numbers(metrics(run), metrics(straight), keys=('train_loss', 'train_top1', 'val_loss', 'lr'))
    assert_same_weights(load(run / 'last.pt'), load(straight / 'last.pt'))
