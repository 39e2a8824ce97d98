"""``python -m planner_service.cli``: the same entry point as the ``planner`` script."""

from planner_service.cli.main import main

main()
