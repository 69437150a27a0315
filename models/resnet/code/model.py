"""A ResNet-style classifier: images in as 224x224x3 bytes (height, width, RGB), the five most
likely of 1000 classes out. The layers and state_dict keys are torchvision's resnet18 with half
its channels, so weights exported from such a PyTorch model load unchanged."""

import orochi
import orochi.nn as nn
import orochi.nn.functional as F

# Orochi's conv2d adds the residual and applies ReLU as it writes its output; under PyTorch (the
# parity fixture runs this code there too) the same arithmetic runs as separate ops.
FUSED_RELU = "relu" in getattr(F, "CONV2D_ACTIVATIONS", ())

WIDTHS = (32, 64, 128, 256)
CLASSES = 1000
TOP = 5
# ImageNet's per-channel statistics, as torchvision's transforms use them.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


class BasicBlock(nn.Module):
    folded = False  # fold_batch_norms() done: the batch norms are in the convolutions

    def __init__(self, inputs: int, outputs: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.relu = nn.ReLU()
        self.downsample = None
        if stride != 1 or inputs != outputs:
            self.downsample = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride=stride, bias=False), nn.BatchNorm2d(outputs))

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        if self.folded:
            return conv_relu(self.conv2, conv_relu(self.conv1, x), shortcut)
        y = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(y)) + shortcut)

    def fold_batch_norms(self):
        self.conv1, self.bn1 = fold(self.conv1, self.bn1)
        self.conv2, self.bn2 = fold(self.conv2, self.bn2)
        if self.downsample is not None:
            self.downsample = nn.Sequential(*fold(*self.downsample))
        self.folded = True


def fold(conv, bn):
    """(conv, bn) -> (the convolution equal to both, Identity); eval mode only."""
    return nn.utils.fusion.fuse_conv_bn_eval(conv, bn), nn.Identity()


def conv_relu(conv, x, residual=None):
    """relu(conv(x) + residual): one op in Orochi."""
    if FUSED_RELU:
        return F.conv2d(x, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation,
                        conv.groups, residual=residual, activation="relu")
    y = conv(x)
    return (y if residual is None else y + residual).relu()


class ResNet(nn.Module):
    folded = False  # as BasicBlock's

    def __init__(self, widths=WIDTHS, classes=CLASSES):
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages, previous = [], widths[0]
        for index, width in enumerate(widths):
            stride = 1 if index == 0 else 2
            stages.append(nn.Sequential(BasicBlock(previous, width, stride),
                                        BasicBlock(width, width, 1)))
            previous = width
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(widths[-1], classes)

    def forward(self, x):
        if self.folded:
            x = self.maxpool(conv_relu(self.conv1, x))
        else:
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))

    def fold_batch_norms(self):
        """Folds every batch norm into the convolution before it (PyTorch's fuse_conv_bn_eval):
        in eval mode, equal up to float rounding and a pass over the activations fewer each.
        The state_dict keys change, so load the weights first."""
        self.conv1, self.bn1 = fold(self.conv1, self.bn1)
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            for block in stage:
                block.fold_batch_norms()
        self.folded = True
        return self


class ImageClassifier:
    def __init__(self, context):
        # Made on the model's device first, so that the weights (already there, shared by every
        # copy) are bound as they are rather than copied to where the module was made.
        self.network = ResNet().to(context.device)
        self.network.load_state_dict(context.weights)
        self.network.eval()
        self.network.fold_batch_norms()
        # Constants go there too: inputs arrive on the manifest's device.
        self.mean = orochi.tensor(MEAN, device=context.device).reshape(1, 3, 1, 1) * 255
        self.std = orochi.tensor(STD, device=context.device).reshape(1, 3, 1, 1) * 255

    def predict(self, inputs):
        images = inputs["image"].permute(0, 3, 1, 2).float()  # [batch, 3, 224, 224]
        with orochi.no_grad():
            probabilities = self.network((images - self.mean) / self.std).softmax(-1)
            top = probabilities.topk(TOP, dim=-1)
        return {"classes": top.indices, "probabilities": top.values}
