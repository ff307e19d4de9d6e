from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Make a local staff login for `make run` if none exists; print its password once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")

    def handle(self, *args: Any, username: str, **options: Any) -> None:
        users = get_user_model()
        if users.objects.filter(username=username).exists():
            self.stdout.write(
                f"login: {username} (password printed when it was made; reset it with "
                f"`python manage.py changepassword {username}`)"
            )
            return
        password = secrets.token_urlsafe(12)
        users.objects.create_superuser(username=username, email="", password=password)
        self.stdout.write(f"login: {username}  password: {password}  (shown once)")
