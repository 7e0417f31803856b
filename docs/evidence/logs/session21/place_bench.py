import cProfile, pstats, time
from pathlib import Path
from kpair.harness import Harness
from kpair.backends import open_device
from kpair.replay import Replay
h = Harness.open(Path('/tmp/prof/w/h'))
dev = open_device('host')
pr = cProfile.Profile(); t0 = time.time(); pr.enable()
r = Replay(dev, h.snapshot)
pr.disable(); print('place', time.time() - t0)
pstats.Stats(pr).sort_stats('tottime').print_stats(14)
dev.close()
