"""`python -m gbmw …`: what launchers run (`torchrun -m gbmw train …`, `deepspeed --module gbmw train …`)."""

import sys

from gbmw.cli.main import main

sys.exit(main())
