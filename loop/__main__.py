from loop.run import main

raise SystemExit(main())
