import { type IVisibility, VisiblePoller } from '../src/poller';

class FakeVisibility implements IVisibility {
  shown = true;
  private listeners: (() => void)[] = [];
  visible(): boolean {
    return this.shown;
  }
  onChange(listener: () => void): () => void {
    this.listeners.push(listener);
    return () => (this.listeners = this.listeners.filter(l => l !== listener));
  }
  set(shown: boolean): void {
    this.shown = shown;
    this.listeners.forEach(l => l());
  }
  get subscribers(): number {
    return this.listeners.length;
  }
}

describe('VisiblePoller', () => {
  beforeEach(() => jest.useFakeTimers());
  afterEach(() => jest.useRealTimers());

  it('polls at once and every interval while the tab is visible', () => {
    const poll = jest.fn();
    const poller = new VisiblePoller(poll, 5000, new FakeVisibility());
    poller.start();
    expect(poll).toHaveBeenCalledTimes(1);
    jest.advanceTimersByTime(15000);
    expect(poll).toHaveBeenCalledTimes(4);
  });

  it('does not poll while hidden, and polls at once when shown again', () => {
    const poll = jest.fn();
    const visibility = new FakeVisibility();
    const poller = new VisiblePoller(poll, 5000, visibility);
    poller.start();
    visibility.set(false);
    expect(poller.running).toBe(false);
    jest.advanceTimersByTime(60000);
    expect(poll).toHaveBeenCalledTimes(1);
    visibility.set(true);
    expect(poll).toHaveBeenCalledTimes(2);
    jest.advanceTimersByTime(5000);
    expect(poll).toHaveBeenCalledTimes(3);
  });

  it('starts hidden without polling, and stops for good', () => {
    const poll = jest.fn();
    const visibility = new FakeVisibility();
    visibility.shown = false;
    const poller = new VisiblePoller(poll, 5000, visibility);
    poller.start();
    jest.advanceTimersByTime(20000);
    expect(poll).not.toHaveBeenCalled();
    poller.stop();
    visibility.set(true);
    jest.advanceTimersByTime(20000);
    expect(poll).not.toHaveBeenCalled();
    expect(visibility.subscribers).toBe(0);
  });

  it('takes a new interval at once, without an extra poll', () => {
    const poll = jest.fn();
    const poller = new VisiblePoller(poll, 5000, new FakeVisibility());
    poller.start();
    poller.interval = 1000;
    expect(poll).toHaveBeenCalledTimes(1);
    jest.advanceTimersByTime(3000);
    expect(poll).toHaveBeenCalledTimes(4);
  });
});
