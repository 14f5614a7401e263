"""The gradient shapes of ResNet-50 (torchvision layout): 161 float32 tensors, 25,557,032 values.

53 convolutions, 53 batch norms (weight and bias each) and the classifier (weight and bias), in
parameter order. Derived from the architecture, so no torchvision is needed.
"""


def resnet50_shapes() -> list[tuple[int, ...]]:
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for width, blocks in zip((64, 128, 256, 512), (3, 4, 6, 3)):
        for block in range(blocks):
            shapes += [(width, inplanes, 1, 1), (width,), (width,),
                       (width, width, 3, 3), (width,), (width,),
                       (4 * width, width, 1, 1), (4 * width,), (4 * width,)]
            if block == 0:
                shapes += [(4 * width, inplanes, 1, 1), (4 * width,), (4 * width,)]
            inplanes = 4 * width
    shapes += [(1000, 2048), (1000,)]
    return shapes


if __name__ == "__main__":
    import numpy as np

    shapes = resnet50_shapes()
    sizes = [int(np.prod(s)) for s in shapes]
    print(f"{len(shapes)} tensors, {sum(sizes):,} values, {4 * sum(sizes) / 1e6:.1f} MB as float32")
    for shape, count in zip(shapes, sizes):
        print(f"{str(shape):>22} {count:>10,}")
