import sys

if sys.argv[1:2] in (["run"], ["learner"], ["actor"]):  # a stop during the imports below is kept, not a traceback
    from streamrl.run import lifecycle

    lifecycle.catch_stop_signals()

from streamrl.commands.cli import main  # noqa: E402

sys.exit(main())
