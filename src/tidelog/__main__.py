import sys

from tidelog.cli.main import main

sys.exit(main())
