"""Draws Olio's static images with Pillow (no downloads): the logo, placeholder pictures for
events and people without one, rating stars and the map placeholder. Run it again after
changing a drawing: `python3 apps/olio/olio/static/make_images.py`."""

import math
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

HERE = Path(__file__).resolve().parent / "images"
GREEN, DARK, LIGHT, GOLD, GREY = (76, 140, 74), (40, 60, 40), (232, 240, 228), (240, 180, 30), (200, 200, 200)


def font(size):
    try:
        return ImageFont.load_default(size)
    except TypeError:  # Pillow < 10.1 has one size
        return ImageFont.load_default()


def logo():
    image = Image.new("RGB", (120, 40), GREEN)
    draw = ImageDraw.Draw(image)
    draw.ellipse((6, 6, 34, 34), fill=LIGHT)
    draw.ellipse((13, 13, 27, 27), fill=GREEN)
    draw.text((42, 7), "Olio", fill=LIGHT, font=font(24))
    return image


def placeholder(kind):
    image = Image.new("RGB", (60, 60), LIGHT)
    draw = ImageDraw.Draw(image)
    if kind == "person":
        draw.ellipse((20, 8, 40, 28), fill=GREY)
        draw.pieslice((8, 30, 52, 74), 180, 360, fill=GREY)
    else:  # a calendar page
        draw.rectangle((12, 14, 48, 50), fill="white", outline=DARK)
        draw.rectangle((12, 14, 48, 22), fill=GREEN)
        for row in range(3):
            for col in range(4):
                x, y = 16 + col * 8, 26 + row * 8
                draw.rectangle((x, y, x + 4, y + 4), fill=GREY)
    return image


def star(on):
    image = Image.new("RGBA", (12, 12), (0, 0, 0, 0))
    points = []
    for i in range(10):
        radius = 5.8 if i % 2 == 0 else 2.5
        angle = -math.pi / 2 + i * math.pi / 5
        points.append((6 + radius * math.cos(angle), 6 + radius * math.sin(angle)))
    ImageDraw.Draw(image).polygon(points, fill=GOLD if on else GREY)
    return image


def map_tile():
    image = Image.new("RGB", (240, 160), (226, 236, 220))
    draw = ImageDraw.Draw(image)
    for x in range(0, 240, 30):
        draw.line((x, 0, x + 40, 160), fill="white", width=4)
    for y in range(0, 160, 40):
        draw.line((0, y, 240, y + 10), fill="white", width=3)
    draw.polygon([(120, 80), (112, 62), (128, 62)], fill=(200, 40, 40))
    draw.ellipse((111, 52, 129, 70), fill=(200, 40, 40))
    return image


def main():
    HERE.mkdir(exist_ok=True)
    drawings = {"logo.png": logo(), "event.png": placeholder("event"), "person.png": placeholder("person"),
                "star-on.png": star(True), "star-off.png": star(False), "map.png": map_tile()}
    for name, image in drawings.items():
        image.save(HERE / name, optimize=True)
        print(HERE / name)


if __name__ == "__main__":
    main()
