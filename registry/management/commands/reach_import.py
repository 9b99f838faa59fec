"""python manage.py reach_import PATH... [--activate]"""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from reach_platform.errors import ApplicationError
from registry.descriptors import DescriptorError, descriptors_import, parse_file


class Command(BaseCommand):
    help = "Validate and import capability descriptors (YAML, one file per agent). Idempotent."

    def add_arguments(self, parser):
        parser.add_argument("paths", nargs="+", help="YAML files or directories holding *.yaml / *.yml")
        parser.add_argument("--activate", action="store_true",
                            help="Trusted admins only: make the imported versions ACTIVE without review.")

    def handle(self, *args, paths, activate, **options):
        files: list[Path] = []
        for raw in paths:
            path = Path(raw)
            if path.is_dir():
                files += sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml"))
            elif path.exists():
                files.append(path)
            else:
                raise CommandError(f"{raw}: no such file or directory")
        if not files:
            raise CommandError("No descriptor files found.")
        errors: list[DescriptorError] = []
        parsed = [p for p in (parse_file(f, errors) for f in files) if p is not None]
        if errors:
            for error in errors:
                self.stderr.write(str(error))
            raise CommandError(f"{len(errors)} error(s) in {len({e.file for e in errors})} file(s); nothing imported.")
        total = sum(len(p.capabilities) for p in parsed)
        with tqdm(total=total, desc="Importing capabilities", unit="cap", disable=options["verbosity"] == 0) as bar:
            try:
                result = descriptors_import(parsed=parsed, activate=activate, progress=lambda: bar.update(1))
            except ApplicationError as exc:
                raise CommandError(exc.message)
        self.stdout.write(
            f"{len(files)} file(s): {len(result.created)} new version(s), {len(result.unchanged)} unchanged, "
            f"{len(result.activated)} activated."
        )
