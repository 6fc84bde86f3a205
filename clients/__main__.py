from clients.cli import main

raise SystemExit(main())
