from mini_kv.cli import main

raise SystemExit(main())
