import sys

from streamrl.commands.cli import main

sys.exit(main())
